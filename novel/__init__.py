"""Pure domain logic: outline model, next work, pack rendering, context assembly, guards.

Nothing in this package does I/O, reads a clock or draws randomness (ARCH-3).
"""

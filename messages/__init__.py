"""The wire contract: frozen msgspec Structs, one module per family, a union per subject (BUS-1).

Data only. Every message is a tagged Struct (`type` field) and travels as JSON with its type
tag and schema version repeated in NATS headers (see bus.codec).
"""

SCHEMA_VERSION = 1

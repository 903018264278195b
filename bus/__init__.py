"""novelbus bus."""

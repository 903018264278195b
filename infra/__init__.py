"""novelbus infra."""

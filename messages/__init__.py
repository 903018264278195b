"""novelbus messages."""

"""novelbus writers."""

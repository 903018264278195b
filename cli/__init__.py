"""novelbus cli."""

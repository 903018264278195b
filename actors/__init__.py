"""novelbus actors."""

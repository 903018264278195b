"""novelbus store."""

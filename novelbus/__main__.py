"""`python -m novelbus …` is the `novelbus` command."""

from novelbus.cli.main import app

if __name__ == "__main__":
    app()

"""The package version, in its own module so every layer can read it without importing the
package root (which re-exports the facades)."""

__version__ = "0.1.0"

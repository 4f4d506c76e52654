"""Raylane."""

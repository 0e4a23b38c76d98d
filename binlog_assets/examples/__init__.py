"""Handlers a user would write, shipped as working examples (README "Write your handlers")."""

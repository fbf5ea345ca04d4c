"""Triton Python-backend model classes shared by several model folders (stub-only imports)."""

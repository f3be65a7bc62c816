"""Shared test helpers: daemon fixtures, end-to-end helpers, allocator case generation."""

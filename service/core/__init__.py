"""Pure numpy attention maths: normalizers, masks, attention and diagnostics.

Nothing in this package imports FastAPI or Pydantic; it is usable as a library.
"""

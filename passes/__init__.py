"""hxmlir.passes: Python passes over ``jaxlib.mlir`` modules, and their pipeline."""

"""The shapes world: procedural scenes, their caption grammar and a detector for them."""

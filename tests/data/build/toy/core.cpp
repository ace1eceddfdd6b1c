int toy_tile() { return TOY_TILE; }

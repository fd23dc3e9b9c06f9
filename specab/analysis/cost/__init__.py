"""Cost: what a verdict costs and the design that buys the next one."""

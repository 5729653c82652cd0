"""Built-in plugin worker modules: real examples to run or copy."""

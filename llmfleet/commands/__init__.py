"""Commands of the fleet core: validate, plan, hash-key."""

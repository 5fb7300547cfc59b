"""`python -m harness.results`: an alias of `harness.store.summary` (the results store)."""
from harness.store.summary import main

if __name__ == "__main__":
    raise SystemExit(main())

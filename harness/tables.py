"""`python -m harness.tables`: an alias of `harness.report.tables` (the reporting package)."""
from harness.report.tables import main

if __name__ == "__main__":
    raise SystemExit(main())

from __future__ import annotations

from tuner.cli import main

if __name__ == "__main__":
    main()

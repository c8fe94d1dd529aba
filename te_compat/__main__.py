from te_compat.cli import main

raise SystemExit(main())

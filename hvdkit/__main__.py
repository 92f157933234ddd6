from hvdkit.cli.main import main

raise SystemExit(main())

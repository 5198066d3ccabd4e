from crishim.cli import main

raise SystemExit(main())

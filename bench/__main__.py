from .suite import main

raise SystemExit(main())

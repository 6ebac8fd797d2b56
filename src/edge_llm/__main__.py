from edge_llm.cli import main

raise SystemExit(main())

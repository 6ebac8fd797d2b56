from edge_llm.cli.main import main

raise SystemExit(main())

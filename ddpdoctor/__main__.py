from ddpdoctor.cli import main

raise SystemExit(main())

import sys; from runc_guard.shim.entry import main; sys.exit(main())  # noqa: E702, I001

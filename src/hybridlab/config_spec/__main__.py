"""`python -m hybridlab.config_spec`: print the generated config JSON Schema, or describe a section."""

from hybridlab.config_spec.sections import main

raise SystemExit(main())

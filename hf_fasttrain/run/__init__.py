"""Running: one recipe run from a resolved config, its random-restart runner, --dry_run, generate and push."""

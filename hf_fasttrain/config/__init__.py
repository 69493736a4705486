"""Configuration: the arguments, the recipe files and the settings derived from them (budget_aware)."""

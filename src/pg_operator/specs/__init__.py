"""See docs/contracts.md (binding interfaces) and docs/helper-rules.md before changing this package."""

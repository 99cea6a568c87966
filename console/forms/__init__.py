"""The console's forms, one module per screen group."""

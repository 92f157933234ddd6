"""Command-line interface: one module per `hvdkit` subcommand."""

"""Support for the example scripts (examples/): their offline datasets."""

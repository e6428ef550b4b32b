"""The version of the edgeinfer core: a leaf, so that a module in any room (the stamp, the bundle
manifest) can record it without importing the root package and every room it loads."""

__version__ = "0.1.0"

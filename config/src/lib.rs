//! profcol configuration.

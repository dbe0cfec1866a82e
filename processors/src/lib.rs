//! profcol processors.

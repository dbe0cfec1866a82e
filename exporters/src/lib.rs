//! profcol exporters.

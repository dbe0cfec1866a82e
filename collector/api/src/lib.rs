//! profcol component API.

//! profcol receivers.

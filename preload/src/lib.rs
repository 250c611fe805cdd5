//! libtessera.so

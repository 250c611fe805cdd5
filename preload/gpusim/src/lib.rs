//! gpusim

//! Types shared by the eBPF programs and the agent.
#![no_std]

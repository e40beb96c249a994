"""The shared test toolkit: process harness (`procs`), polling (`wait`) and stack documents (`stacks`)."""

"""Reading the GPUs: the background poller, its deadline-bound worker threads, and the snapshot it publishes."""

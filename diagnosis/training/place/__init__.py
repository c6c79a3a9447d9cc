"""Who printed a line: host, rank, GPU and worker pieced together across the lines and inputs."""

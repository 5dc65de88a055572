"""Development tools shared by the tests, the demo and the benchmarks.

netns: private network namespaces and nftables faults; harness: the reference fleet
server and the agent as real processes. Not shipped in the .deb.
"""

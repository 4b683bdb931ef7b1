"""The benchmark behind scripts/bench: tfrfs against ratarmount serving the same files from a tar
on the read side (local, or from an S3 bucket with --remote), and tfrfs's write-back (--rw
writes, commit) against cp; what it measures and how is in cli.ABOUT, the text of
`scripts/bench --help`."""

# The parts, one responsibility each (scripts/bench is only the entry):
#   common     bench-out/ paths, progress lines, running commands
#   datasets   the datasets (read side and write-back), their file lists, the tar
#   tools      tfrfs, ratarmount and plain files as mountable tools; /proc figures of a daemon
#   workloads  the read phases and the one reader they share
#   schedule   fresh mounts, cache drops, repeats and the ABBA order; per-tool summaries
#   report     the read side's tables and notes
#   writeback  the write-back phases and their table
#   remote     --remote: the same read phases against S3 on loopback, with ratarmount and an s3fs copy
#   s3copy     the s3fs copy, run as a process of its own
#   cli        flags and main

"""The runner: one experiment's steps walked, executed on their hosts and recorded in the store."""

"""The bottom layer: the clock, plain record types, and the errors a user can cause with their exit codes.

Imports nothing of loadgen; every other package may import it.
"""

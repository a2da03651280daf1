"""The decode loop's parts beside the loop itself (``search/driver.py``): the state it steps, one engine
call for rows of slots, request intake, results, and the lookahead's phases."""

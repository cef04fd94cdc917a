"""The command layer: everything that talks to a person (click, prompts, terminal checks, printing).

``kvreport.cli`` declares the commands and their options; each ``cli_*`` here turns the options
into calls of the plain functions of the domain modules (``kvreport.collect``, ``kvreport.fit``,
``kvreport.upload``) and prints what they return. The domain modules import no click: importing
``kvreport.analyze``, ``kvreport.fit``, ``kvreport.collect`` or ``kvreport.upload`` never loads it.
"""

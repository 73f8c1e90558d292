"""``mmd grade``: the instructor's grading of a class's kernel files (docs/grading.md, "mmd grade").

* :mod:`.handins`: the class's kernels, from a hand-in folder (a folder per student) or the service's store,
  each with when it arrived (the store's record of when the service received it; a plain folder's ctime);
* :mod:`.testset`: the instructor's data sets (TESTS), paired as ``mmd check`` pairs them, each read once;
* :mod:`.grader`: one kernel graded: compiled, checked over TESTS at every tile of the plan, then timed over
  the course's plan with fresh inputs for every timed launch, each product checked;
* :mod:`.records`: what grading decides, as data (a student's part, written and read back for ``--slurm``);
* :mod:`.reports`: the results as ``mmd check``'s table, JSON and JUnit, and the class report page;
* :mod:`.array`: a Slurm array of one task per student, and the gathering of their parts.
"""

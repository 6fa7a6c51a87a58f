package control

// CrashEnv names the environment TestCrashHelper takes (netns, state
// directory, the change after which it kills itself), for the external
// tests that run it too.
var CrashEnv = struct{ NetNS, Dir, After string }{crashEnvNetNS, crashEnvDir, crashEnvAfter}
